"""Print this image's runtime and its Python packages as JSON (sandbox-images/build.sh stores it
next to metadata.yaml; GET /v1/languages shows it)."""

import importlib.metadata
import json
import platform

packages = {dist.metadata["Name"].lower(): dist.version for dist in importlib.metadata.distributions()}
runtime = {"name": platform.python_implementation(), "version": platform.python_version()}
print(json.dumps({"runtime": runtime, "packages": dict(sorted(packages.items()))}))
