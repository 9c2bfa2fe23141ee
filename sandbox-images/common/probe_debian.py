"""Print an image's runtime and its Debian packages as JSON, for sandbox-images/build.sh:
`probe_debian.py NAME 'VERSION COMMAND' PACKAGE...` (the first x.y[.z] in the command's output is
the runtime's version; each package's version is dpkg's)."""

import json
import re
import subprocess
import sys

name, command, packages = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
said = subprocess.run(command, capture_output=True, text=True, check=True)
version = re.search(r"\d+\.\d+(?:\.\d+)?", said.stdout + said.stderr)
listed = subprocess.run(
    ["dpkg-query", "-W", "-f", "${Package}\t${Version}\n", *packages], capture_output=True, text=True, check=True
)
found = dict(line.split("\t", 1) for line in listed.stdout.splitlines() if "\t" in line)
print(json.dumps({"runtime": {"name": name, "version": version.group(0) if version else ""}, "packages": found}))
