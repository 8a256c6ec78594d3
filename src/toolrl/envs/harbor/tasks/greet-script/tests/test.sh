#!/bin/bash
# Harbor's contract: the verifier writes the reward to /logs/verifier/reward.txt (the folder exists).
if python3 -I -S /tests/check.py; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
