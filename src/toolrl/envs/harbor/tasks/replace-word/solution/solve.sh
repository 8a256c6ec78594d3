#!/bin/bash
sed -i 's/colour/color/g' /app/docs/*.md
