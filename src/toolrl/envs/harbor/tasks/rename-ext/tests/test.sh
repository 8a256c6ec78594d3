#!/bin/bash
# Harbor's contract: the verifier writes the reward to /logs/verifier/reward.txt (the folder exists).
cd /app/notes 2>/dev/null && names=(*) && [ "${names[*]}" = "keep.csv monday.md tuesday.md" ] && [ "$(< monday.md)" = m ] &&
  echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
