set -eu
x=$(echo OK | tr -d "\n")
echo "$x"
