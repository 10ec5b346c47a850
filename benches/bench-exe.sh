# Sourced by the bench scripts: `bench_exe NAME` builds the bench NAME if
# needed and prints the path of its executable.
bench_exe() {
  cargo bench --bench "$1" --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
name=sys.argv[1]
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m["target"]["name"]==name and m.get("executable"): print(m["executable"])' "$1"
}
