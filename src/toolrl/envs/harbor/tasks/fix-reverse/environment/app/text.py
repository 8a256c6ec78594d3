def reverse_words(sentence):
    return " ".join(sentence.split())
