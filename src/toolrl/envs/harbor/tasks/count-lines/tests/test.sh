#!/bin/bash
# Harbor's contract: the verifier writes the reward to /logs/verifier/reward.txt (the folder exists).
read -r count < /app/count.txt 2>/dev/null
[ "$count" = 37 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
