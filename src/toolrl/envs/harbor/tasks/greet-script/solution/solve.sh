#!/bin/bash
printf 'import sys\nprint(f"hello, {sys.argv[1]}")\n' > /app/greet.py
