import sys

sys.path.insert(0, "/app")
from calc import add

assert add(2, 3) == 5 and add(10, -4) == 6 and add(0, 0) == 0
