import sys

sys.path.insert(0, "/app")
from text import reverse_words

assert reverse_words("a b c") == "c b a"
assert reverse_words("one two") == "two one"
