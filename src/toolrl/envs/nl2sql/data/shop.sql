-- The bundled NL2SQL database: a small shop. Built into an in-memory sqlite database; every trajectory
-- works on its own copy.
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT NOT NULL, joined DATE NOT NULL);
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT NOT NULL, category TEXT NOT NULL, price REAL NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     order_date DATE NOT NULL, status TEXT NOT NULL);
CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id),
                          product_id INTEGER NOT NULL REFERENCES products(id), quantity INTEGER NOT NULL);

INSERT INTO customers VALUES
  (1, 'Ada', 'London', '2023-01-15'), (2, 'Bruno', 'Paris', '2023-03-02'), (3, 'Chen', 'Berlin', '2023-04-20'),
  (4, 'Dana', 'London', '2023-06-11'), (5, 'Emil', 'Madrid', '2023-08-30'), (6, 'Fatima', 'Paris', '2024-01-05'),
  (7, 'Goran', 'Berlin', '2024-02-14'), (8, 'Hana', 'Tokyo', '2024-05-09'), (9, 'Ivan', 'Madrid', '2024-07-21'),
  (10, 'Julia', 'London', '2024-09-03');

INSERT INTO products VALUES
  (1, 'Desk Lamp', 'home', 24.5), (2, 'Office Chair', 'furniture', 149.0), (3, 'Notebook', 'stationery', 3.2),
  (4, 'Fountain Pen', 'stationery', 35.0), (5, 'Bookshelf', 'furniture', 89.9), (6, 'Coffee Mug', 'home', 8.0),
  (7, 'Standing Desk', 'furniture', 399.0), (8, 'Stapler', 'stationery', 12.75), (9, 'Wall Clock', 'home', 19.99),
  (10, 'Monitor Arm', 'furniture', 59.0), (11, 'Pencil Set', 'stationery', 6.5), (12, 'Throw Pillow', 'home', 15.0);

INSERT INTO orders VALUES
  (1, 1, '2024-01-10', 'shipped'), (2, 2, '2024-01-22', 'shipped'), (3, 1, '2024-02-03', 'cancelled'),
  (4, 3, '2024-02-17', 'shipped'), (5, 4, '2024-03-05', 'pending'), (6, 5, '2024-03-18', 'shipped'),
  (7, 2, '2024-04-01', 'shipped'), (8, 6, '2024-04-12', 'pending'), (9, 7, '2024-05-06', 'shipped'),
  (10, 8, '2024-05-27', 'shipped'), (11, 3, '2024-06-14', 'cancelled'), (12, 9, '2024-07-30', 'shipped'),
  (13, 1, '2024-08-08', 'shipped'), (14, 10, '2024-09-15', 'pending'), (15, 4, '2024-10-01', 'shipped'),
  (16, 6, '2024-10-19', 'shipped'), (17, 2, '2024-11-02', 'pending'), (18, 8, '2024-11-25', 'shipped');

INSERT INTO order_items VALUES
  (1, 1, 2), (1, 3, 5), (2, 2, 1), (3, 7, 1), (4, 4, 2), (4, 11, 3), (5, 5, 1), (5, 6, 4), (6, 8, 2),
  (7, 9, 1), (7, 12, 2), (8, 10, 1), (9, 2, 2), (9, 6, 6), (10, 3, 10), (10, 4, 1), (11, 7, 1), (12, 1, 1),
  (12, 9, 2), (13, 5, 1), (13, 8, 1), (14, 11, 4), (15, 12, 3), (15, 6, 2), (16, 7, 1), (17, 3, 8),
  (18, 10, 2), (18, 1, 1);
