#!/bin/bash
tr '[:lower:]' '[:upper:]' < /app/input.txt > /app/output.txt
