#!/bin/bash
sed -i 's/sentence.split()/reversed(sentence.split())/' /app/text.py
