#!/bin/bash
# Harbor's contract: the verifier writes the reward to /logs/verifier/reward.txt (the folder exists).
want=$'1\n2\nFizz\n4\nBuzz\nFizz\n7\n8\nFizz\nBuzz\n11\nFizz\n13\n14\nFizzBuzz'
[ -x /app/fizzbuzz.sh ] && [ "$(timeout 5 /app/fizzbuzz.sh)" = "$want" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
