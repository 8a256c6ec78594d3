import subprocess

out = subprocess.run(["python3", "/app/greet.py", "ada"], capture_output=True, text=True, timeout=5).stdout
assert out.strip() == "hello, ada", out
