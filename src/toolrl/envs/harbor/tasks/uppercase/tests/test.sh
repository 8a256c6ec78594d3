#!/bin/bash
# Harbor's contract: the verifier writes the reward to /logs/verifier/reward.txt (the folder exists).
want=$'HARBOR TASKS ARE FOLDERS.\nEACH ONE HAS TESTS.'
[ -f /app/output.txt ] && [ "$(< /app/output.txt)" = "$want" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
