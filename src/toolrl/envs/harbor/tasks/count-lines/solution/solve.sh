#!/bin/bash
wc -l < /app/data.txt > /app/count.txt
