#!/bin/bash
# Harbor's contract: the verifier writes the reward to /logs/verifier/reward.txt (the folder exists).
ok() {
  [ "$(< /app/docs/a.md)" = "The color of the sky." ] && [ "$(< /app/docs/b.md)" = "No color here, color there." ] &&
    [ "$(< /app/docs/notes.txt)" = "colour stays in txt" ]
}
ok 2>/dev/null && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
