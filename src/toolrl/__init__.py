"""toolrl: reinforcement-learning post-training of language models on multi-turn tool use."""

__version__ = "0.1.0"
