#!/bin/bash
grep -c ERROR /app/app.log > /app/errors.txt
