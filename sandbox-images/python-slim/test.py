import importlib.util
import json
import sys

assert sys.version_info >= (3, 12)
assert importlib.util.find_spec("numpy") is None  # slim: the standard library only
print(json.loads('"OK"'))
