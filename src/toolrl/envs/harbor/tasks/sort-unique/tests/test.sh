#!/bin/bash
# Harbor's contract: the verifier writes the reward to /logs/verifier/reward.txt (the folder exists).
want=$'apple\nbanana\nfig\nkiwi\npear'
[ -f /app/sorted.txt ] && [ "$(< /app/sorted.txt)" = "$want" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
