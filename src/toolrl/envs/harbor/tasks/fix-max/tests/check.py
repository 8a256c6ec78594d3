import sys

sys.path.insert(0, "/app")
from stats import largest

assert largest([3, 9, 2]) == 9 and largest([-5, -2, -7]) == -2 and largest([4]) == 4
