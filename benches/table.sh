# Helpers that print the benchmark table, sourced by run.sh and postgres.sh (not run alone).
# The JSON is flat with unique field names, so a field is found by name without a JSON tool.
jget() { # key [file] -> value, or nothing
    { grep -o "\"$1\":[^,}]*" "${2:-/dev/stdin}" 2>/dev/null || true; } | head -1 |
        cut -d: -f2- | tr -d '"' | sed 's/^null$//'
}
calc() { awk "BEGIN { printf \"%.${2:-1}f\", $1 }"; }
max() { awk -v a="${1:-0}" -v b="${2:-0}" 'BEGIN { print (a > b) ? a : b }'; }

row() { # label value op target [unit]
    local label=$1 value=$2 op=$3 target=$4 status
    if [ -z "$op" ]; then
        status="" # a figure reported without a target
        value=${value:-n/a}
    elif [ -z "$value" ] || [ -z "$target" ]; then
        status="n/a"
        value=${value:-n/a}
    else
        status=$(awk -v v="$value" -v t="$target" -v op="$op" 'BEGIN {
            ok = (op == "<=") ? v <= t : (op == ">=") ? v >= t : (op == "==") ? v == t : 1
            print (ok ? "ok" : "MISS") }')
    fi
    printf '%-58s %14s  %-3s %-12s %s\n' "$label" "$value" "$op" "$target" "$status"
}

values() { # run field -> the field's value in each repetition of the run, one per line
    local f
    for f in "$OUT/$1".*.json; do
        [ -f "$f" ] && jget "$2" "$f"
    done | grep -v '^$' || true
}
F() { # run field -> median over the repetitions (the lower middle for an even count)
    values "$1" "$2" | sort -g | awk '{ v[NR] = $0 } END { if (NR) print v[int((NR + 1) / 2)] }'
}
Fmax() { # run field -> the worst (largest) over the repetitions
    values "$1" "$2" | sort -g | tail -1
}
ratio() { # a b -> a/b, or nothing
    if [ -n "$1" ] && [ -n "$2" ] && awk -v b="$2" 'BEGIN { exit !(b > 0) }'; then
        calc "$1 / $2" 3
    fi
}
