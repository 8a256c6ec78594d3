from stats import largest

assert largest([3, 9, 2]) == 9
assert largest([-5, -2, -7]) == -2
print("ok")
