#!/bin/bash
# Harbor's contract: the verifier writes the reward to /logs/verifier/reward.txt (the folder exists).
read -r total < /app/total.txt 2>/dev/null
[ "$total" = 62 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
