#!/bin/bash
python3 -c "import json; print('\n'.join(u['name'] for u in json.load(open('/app/users.json')) if u['age'] > 30))" > /app/names.txt
