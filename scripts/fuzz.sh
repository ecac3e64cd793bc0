#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/fuzz_targets for a bounded time each, on the stable
# toolchain, and fails on the first crash.
#
#   scripts/fuzz.sh [SECONDS]        # default 30 s per target
#
# Environment:
#   FUZZ_TARGETS="a b"   only these targets (default: every fuzz/fuzz_targets/*.rs)
#   FUZZ_SANITIZER=none  skip AddressSanitizer (default: address; the parser is safe Rust, so
#                        `none` loses little and runs ~2x faster)
#   FUZZ_JOBS=N          libFuzzer workers per target (default 1)
#   CARGO_TARGET_DIR     where to build (default fuzz/target)
#
# cargo-fuzz needs nightly-only rustc flags (-Zsanitizer, sancov passes); RUSTC_BOOTSTRAP=1
# lets the stable compiler accept them, so no nightly toolchain is used. cargo-fuzz is
# installed from crates.io if missing (about a minute on 2 cores).
# Crashes are left in fuzz/artifacts/<target>/; reproduce with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run <target> fuzz/artifacts/<target>/<file>
set -euo pipefail

seconds="${1:-30}"
root="$(cd "$(dirname "$0")/.." && pwd)"
fuzz_dir="$root/fuzz"
sanitizer="${FUZZ_SANITIZER:-address}"
jobs="${FUZZ_JOBS:-1}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

cd "$fuzz_dir"
if [[ -n "${FUZZ_TARGETS:-}" ]]; then
    read -r -a targets <<<"$FUZZ_TARGETS"
else
    targets=()
    for file in fuzz_targets/*.rs; do
        [[ -e "$file" ]] || continue
        targets+=("$(basename "$file" .rs)")
    done
fi
if [[ ${#targets[@]} -eq 0 ]]; then
    echo "fuzz.sh: no targets in $fuzz_dir/fuzz_targets" >&2
    exit 1
fi

known="$(cargo fuzz list)"
for target in "${targets[@]}"; do
    if ! grep -qx -- "$target" <<<"$known"; then
        echo "fuzz.sh: fuzz_targets/$target.rs has no [[bin]] in fuzz/Cargo.toml" \
            "(cargo fuzz add $target writes one)" >&2
        exit 1
    fi
done

# Protocol-family dictionary: text_parse and text_* use dict/text.dict, meta_* dict/meta.dict...
dict_for() {
    local target="$1" family="${1%%_*}"
    for candidate in "dict/$target.dict" "dict/$family.dict"; do
        if [[ -f "$candidate" ]]; then
            echo "$candidate"
            return
        fi
    done
}

status=0
for target in "${targets[@]}"; do
    corpus="corpus/$target"
    mkdir -p "$corpus"
    if [[ -d "seeds/$target" ]]; then
        cp -n "seeds/$target"/* "$corpus"/ 2>/dev/null || true
    fi
    args=(-max_total_time="$seconds" -print_final_stats=1)
    dict="$(dict_for "$target")"
    if [[ -n "$dict" ]]; then
        args+=(-dict="$dict")
    fi
    if [[ "$jobs" -gt 1 ]]; then
        args+=(-fork="$jobs")
    fi
    echo "fuzz.sh: $target for ${seconds}s (sanitizer $sanitizer${dict:+, $dict})" >&2
    if ! cargo fuzz run --sanitizer "$sanitizer" "$target" "$corpus" -- "${args[@]}"; then
        echo "fuzz.sh: $target FAILED; see fuzz/artifacts/$target/" >&2
        status=1
        break
    fi
done
exit "$status"
