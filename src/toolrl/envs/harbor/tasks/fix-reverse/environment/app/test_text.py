from text import reverse_words

assert reverse_words("a b c") == "c b a"
print("ok")
