"""The shop behind the `support` environment: a seeded database of customers and orders, the tools an agent
works it with (bound to one episode's copy), and the scenarios its users come with.

Every tool checks the policy's rules that a tool can check (an identified customer, their own order, the
order's status) and answers an error otherwise, so that a policy broken by the agent shows in the database."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from typing import Any

from toolrl.tools.function import Tool, tool_from_function

FIRST = ["Ada", "Ben", "Cleo", "Dev", "Edith", "Femi", "Gus", "Hana", "Ivo", "June", "Kofi", "Lena", "Milo", "Nia"]
LAST = ["Moss", "Reyes", "Okafor", "Lind", "Haas", "Varga", "Quist", "Bauer", "Sato", "Ng", "Ferris", "Dahl"]
PRODUCTS = {
    "lamp": 24.5, "kettle": 31.0, "mug": 8.25, "blanket": 42.0, "teapot": 19.75, "candle": 6.5,
    "cushion": 15.0, "vase": 27.4, "clock": 36.9, "rug": 58.0,
}  # fmt: skip
STREETS = ["Elm St", "Harbor Rd", "Mill Lane", "Quay St", "Birch Ave", "Kiln Row"]
STATUSES = ("pending", "delivered")


def make_database(seed: int, customers: int = 24) -> dict[str, Any]:
    """Customers (name, email, zip, address) with 2-3 orders each (status, items with prices, address)."""
    rng = random.Random(seed)
    db: dict[str, Any] = {"customers": {}, "orders": {}}
    for c in range(customers):
        first, last = rng.choice(FIRST), rng.choice(LAST)
        cid = f"C{100 + c}"
        address = f"{rng.randint(1, 99)} {rng.choice(STREETS)}"
        email = f"{first.lower()}.{last.lower()}{c}@example.com"
        db["customers"][cid] = {"name": f"{first} {last}", "email": email, "zip": f"{rng.randint(10000, 99999)}",
                                "address": address, "orders": []}  # fmt: skip
        for _ in range(rng.randint(2, 3)):
            oid = f"O{1000 + len(db['orders'])}"
            names = rng.sample(sorted(PRODUCTS), rng.randint(1, 3))
            items = [{"id": f"{oid}-{i + 1}", "product": p, "price": PRODUCTS[p]} for i, p in enumerate(names)]
            status = STATUSES[len(db["orders"]) % 2]
            db["orders"][oid] = {"customer": cid, "status": status, "items": items, "address": address, "refund": 0.0}
            db["customers"][cid]["orders"].append(oid)
    return db


def canonical(db: dict[str, Any]) -> str:
    """The database as one comparable text."""
    return json.dumps(db, sort_keys=True)


def money(value: float) -> str:
    return f"{value:.2f}"


class Shop:
    """One episode's copy of the database and the customer identified in it."""

    def __init__(self, db: dict[str, Any]):
        self.db = copy.deepcopy(db)
        self.customer: str | None = None

    def _order(self, order_id: str) -> dict[str, Any]:
        if self.customer is None:
            raise ValueError("identify the customer first with find_customer(email, zip)")
        order = self.db["orders"].get(order_id)
        if order is None or order["customer"] != self.customer:
            raise ValueError(f"no order {order_id} of this customer")
        return order

    def find_customer(self, email: str, zip: str) -> str:
        """Identify the customer by their email and zip code (needed before anything else).

        Args:
            email: The customer's email address.
            zip: The customer's zip code.
        """
        for cid, customer in self.db["customers"].items():
            if customer["email"] == email.strip().lower() and customer["zip"] == zip.strip():
                self.customer = cid
                return f"customer {cid}: {customer['name']}; orders: {', '.join(customer['orders'])}"
        raise ValueError("no customer with this email and zip code")

    def get_order(self, order_id: str) -> dict[str, Any]:
        """Show one of the identified customer's orders: status, items with prices, address.

        Args:
            order_id: The order's id, such as O1003.
        """
        order = self._order(order_id)
        total = money(sum(item["price"] for item in order["items"]))
        return {"order": order_id, "status": order["status"], "items": order["items"], "total": total,
                "address": order["address"]}  # fmt: skip

    def cancel_order(self, order_id: str) -> str:
        """Cancel a pending order; its total is refunded.

        Args:
            order_id: The order's id.
        """
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ValueError(f"order {order_id} is {order['status']}: only a pending order can be cancelled")
        order["status"], order["refund"] = "cancelled", round(sum(item["price"] for item in order["items"]), 2)
        return f"order {order_id} cancelled; refund {money(order['refund'])}"

    def change_address(self, order_id: str, address: str) -> str:
        """Change where a pending order is sent.

        Args:
            order_id: The order's id.
            address: The new address, such as 12 Elm St.
        """
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ValueError(f"order {order_id} is {order['status']}: only a pending order's address can change")
        order["address"] = " ".join(address.split())
        return f"order {order_id} will go to {order['address']}"

    def return_items(self, order_id: str, item_ids: list[str]) -> str:
        """Return items of a delivered order; their prices are refunded.

        Args:
            order_id: The order's id.
            item_ids: The ids of the items to return, such as O1003-1.
        """
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ValueError(f"order {order_id} is {order['status']}: only a delivered order's items can be returned")
        items = {item["id"]: item for item in order["items"]}
        unknown = [i for i in item_ids if i not in items or items[i].get("returned")]
        if unknown or not item_ids:
            raise ValueError(f"no returnable item {unknown[0] if unknown else '(none given)'} in order {order_id}")
        for i in item_ids:
            items[i]["returned"] = True
        order["refund"] = round(order["refund"] + sum(items[i]["price"] for i in item_ids), 2)
        if all(item.get("returned") for item in order["items"]):
            order["status"] = "returned"
        return f"returned {', '.join(item_ids)}; refund {money(sum(items[i]['price'] for i in item_ids))}"

    def tools(self) -> list[Tool]:
        names = ("find_customer", "get_order", "cancel_order", "change_address", "return_items")
        return [tool_from_function(getattr(self, name), isolation="thread") for name in names]


@dataclass(frozen=True)
class Case:
    """One user's errand: what they say and want (the scenario), the calls that do it, what they must hear."""

    opening: str
    instructions: str
    calls: list[dict[str, Any]]
    outputs: list[str]
    intent: str


def draw_case(db: dict[str, Any], rng: random.Random) -> Case:
    """A customer with one errand on one of their orders: cancel, change the address, return items, or ask the
    total (which changes nothing)."""
    cid = rng.choice(sorted(db["customers"]))
    customer = db["customers"][cid]
    oid = rng.choice(customer["orders"])
    order = db["orders"][oid]
    who = f"You are {customer['name']}. Your email is {customer['email']} and your zip code is {customer['zip']}."
    identify = {"name": "find_customer", "arguments": {"email": customer["email"], "zip": customer["zip"]}}
    total = money(sum(item["price"] for item in order["items"]))
    ids = f"my email is {customer['email']}, zip {customer['zip']}"
    if order["status"] == "pending":
        intent = rng.choice(["cancel", "address", "total"])
    else:
        intent = rng.choice(["return", "total"])
    if intent == "cancel":
        want = f"You want to cancel order {oid}; you want to know how much is refunded."
        call = {"name": "cancel_order", "arguments": {"order_id": oid}}
        opening, outputs = f"Hi, please cancel my order {oid}; {ids}.", [total]
    elif intent == "address":
        new = f"{rng.randint(100, 999)} {rng.choice(STREETS)}"
        want = f"You moved: order {oid} should go to {new} instead."
        call = {"name": "change_address", "arguments": {"order_id": oid, "address": new}}
        opening, outputs = f"Hi, please send order {oid} to {new} instead; {ids}.", []
    elif intent == "return":
        item = rng.choice(order["items"])
        want = f"You want to return the {item['product']} (item {item['id']}) of order {oid} and know the refund."
        call = {"name": "return_items", "arguments": {"order_id": oid, "item_ids": [item["id"]]}}
        opening = f"Hi, I want to return the {item['product']} from order {oid} (item {item['id']}); {ids}."
        outputs = [money(item["price"])]
    else:
        want = f"You want to know the total of order {oid}. You do not want to change anything."
        call = {"name": "get_order", "arguments": {"order_id": oid}}
        opening, outputs = f"Hi, what was the total of my order {oid}? {ids[0].upper()}{ids[1:]}.", [total]
    instructions = f"{who}\n{want}\nYou know nothing else about your account."
    return Case(opening, instructions, [identify, call], outputs, intent)
