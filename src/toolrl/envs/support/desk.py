"""The help desk's whole tool set, for `support` with `handbook: true`: the shop's five tools with the
descriptions a published benchmark gives its tools (what each does, when the policy allows it, what it answers),
and eight more that a real desk has (the customer's profile and orders, the catalogue, a calculator, a
scratchpad, a transfer to a human). With the handbook (handbook.md) the prompt is ~5k tokens before the
customer's first word, the size of real tool-use benchmarks' prompts (bench/long_context.py)."""

from __future__ import annotations

import ast
import operator
from pathlib import Path
from typing import Any

from toolrl.envs.support.shop import PRODUCTS, Shop, money
from toolrl.tools.function import Tool, tool_from_function

HANDBOOK = (Path(__file__).with_name("handbook.md")).read_text()

DESCRIPTIONS = {
    "find_customer": (
        "Identify the customer you are talking with by the email address and the zip code they give you. This is "
        "needed before any other lookup or change (handbook section 2). Answers the customer's id, name and the ids "
        "of their orders, or an error when no customer has both this email and this zip code; in that case ask the "
        "customer to check them, and do not try other spellings."
    ),
    "get_order": (
        "Show one of the identified customer's orders: its status (pending, delivered, cancelled or returned), its "
        "items (item id, product, price, and whether the item was returned), its total with two decimals, and the "
        "address it is or was sent to. Use it to find an item's id when the customer names a product, and to read "
        "a total the customer asks about. Answers an error for an order that is not the customer's."
    ),
    "cancel_order": (
        "Cancel a pending order of the identified customer as a whole; its full total is refunded to the original "
        "payment method. Only a pending order can be cancelled (handbook section 4); a delivered one can be "
        "returned instead. Call it once, only after the customer clearly asked for this order to be cancelled. "
        "Answers the refunded amount, or an error that changed nothing."
    ),
    "change_address": (
        "Send a pending order of the identified customer to another address, written as the customer gives it "
        "(house number and street). Only a pending order's address can change (handbook section 5); the "
        "customer's profile and other orders keep theirs. Answers the new address, or an error that changed "
        "nothing."
    ),
    "return_items": (
        "Return items of a delivered order of the identified customer; each returned item's price is refunded "
        "(handbook section 6). Give exactly the item ids the customer wants to return, all in one call. An item "
        "returned before cannot be returned again; items of a pending order cannot be returned. Answers the "
        "returned item ids and the refunded amount, or an error that changed nothing."
    ),
}


class Desk(Shop):
    """One episode's shop with the help desk's whole tool set."""

    def get_customer(self) -> dict[str, Any]:
        """Read the identified customer's profile: their id, name, email, zip code, default address and the ids of
        their orders. Use it after find_customer when you need the customer's details; it changes nothing.
        Answers an error when no customer has been identified yet."""
        customer = self._customer()
        return {"id": self.customer, **{k: customer[k] for k in ("name", "email", "zip", "address", "orders")}}

    def list_orders(self) -> list[dict[str, Any]]:
        """List the identified customer's orders, each with its id, status, number of items and total with two
        decimals. Use it to find the order a customer describes ("the order with the rug", "my last order")
        rather than names; then read the order itself with get_order. It changes nothing."""
        customer = self._customer()
        orders = [self.db["orders"][oid] | {"id": oid} for oid in customer["orders"]]
        return [{"order": o["id"], "status": o["status"], "items": len(o["items"]),
                 "total": money(sum(i["price"] for i in o["items"]))} for o in orders]  # fmt: skip

    def get_product(self, product: str) -> dict[str, Any]:
        """Look up one product of the catalogue by its name: today's price with two decimals, and a one-line
        description. An order keeps the price it was bought at: refunds use the order's price, not this one.

        Args:
            product: The product's name as the catalogue spells it, such as kettle or blanket (lower case).
        """
        name = product.strip().lower()
        if name not in PRODUCTS:
            raise ValueError(f"no product {product!r}; the catalogue has: {', '.join(sorted(PRODUCTS))}")
        return {"product": name, "price": money(PRODUCTS[name]), "description": f"Harbor Goods {name}, home range"}

    def search_products(self, query: str, max_price: float | None = None) -> list[dict[str, Any]]:
        """Search the catalogue: products whose name contains the query (case does not matter), at most
        max_price when it is given, cheapest first, each with today's price. Answers an empty list when nothing
        matches; tell the customer so, and do not suggest other products they did not ask about.

        Args:
            query: Part of a product's name, such as "lamp" or "tea"; an empty query lists every product.
            max_price: The highest price to show, in the shop's currency; leave it out for any price.
        """
        found = [(price, name) for name, price in PRODUCTS.items() if query.strip().lower() in name]
        found = sorted(p for p in found if max_price is None or p[0] <= max_price)
        return [{"product": name, "price": money(price)} for price, name in found]

    def calculate(self, expression: str) -> str:
        """Compute an arithmetic expression with numbers, + - * / and parentheses, such as "24.5 + 8.25"; answers
        the result with two decimals. Use it for any sum or difference you tell the customer (handbook 8.1).

        Args:
            expression: The expression to compute: numbers, + - * / and parentheses only.
        """
        return money(_arithmetic(ast.parse(expression.strip(), mode="eval").body))

    def think(self, thought: str) -> str:
        """Write down your reasoning before a complicated step (which order the customer means, which items to
        return, whether the policy allows a request). It changes nothing, looks nothing up, and the customer
        does not see it; it answers an empty string.

        Args:
            thought: Your reasoning, in a few sentences.
        """
        return ""

    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the customer to a human agent, with a short summary of their case. Only when the customer
        asks for a human, or their request is within the shop's business but cannot be handled with the tools
        (a damaged item on arrival, a payment dispute, a lost parcel): handbook section 9. Do not transfer a
        request the handbook tells you to deny. After it, tell the customer a human agent will contact them.

        Args:
            summary: The customer's request and what you found, in one or two sentences.
        """
        return "transfer requested; a human agent will contact the customer"

    def _customer(self) -> dict[str, Any]:
        if self.customer is None:
            raise ValueError("identify the customer first with find_customer(email, zip)")
        return self.db["customers"][self.customer]

    def tools(self) -> list[Tool]:
        shop = [tool_from_function(t.fn, t.name, description=DESCRIPTIONS[t.name], isolation="thread")
                for t in super().tools()]  # fmt: skip
        names = ("get_customer", "list_orders", "get_product", "search_products", "calculate", "think",
                 "transfer_to_human_agents")  # fmt: skip
        return shop + [tool_from_function(getattr(self, name), isolation="thread") for name in names]


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _arithmetic(node: ast.AST) -> float:
    """The value of an expression of numbers and + - * / (and unary minus); anything else is an error."""
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_arithmetic(node.left), _arithmetic(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arithmetic(node.operand)
    raise ValueError("calculate takes numbers, + - * / and parentheses only")
