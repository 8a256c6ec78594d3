#!/bin/bash
# Harbor's contract: the verifier writes the reward to /logs/verifier/reward.txt (the folder exists).
want=$'ada\ncy'
[ -f /app/names.txt ] && [ "$(< /app/names.txt)" = "$want" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
