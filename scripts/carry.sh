# Files to a device machine that only takes 64 MiB per call (the working tree included): sourced by
# scripts/real_model_gpu.sh and scripts/real_wise_gpu.sh, which set `py` first.
#   carry_check MIN_MIB            here: stop when a call leaves less room than that (before any work)
#   carry_pack DIR MIN_MIB TITLE   here: DIR/files/* -> DIR/call-NN/ (parts of <= chunk MiB, first fit, largest
#                                  first: few calls) + DIR/MANIFEST (name, sha256, part count) + DIR/plan.txt
#   carry_receive DIR INCOMING DEST  device: copy DIR/call-*/* into INCOMING; put each file whose parts are all
#                                  there together into DEST (sha256 checked, written aside and renamed; a file
#                                  already in DEST that differs stops it, unreplaced); returns 1 while a file
#                                  misses parts, 2 when nothing was ever carried
# CHUNK_MIB=N overrides the part size (default: 63 MiB less the working tree).

carry_tree_mib() {  # what a device call sends besides its carried paths (a tracked file moved away travels not)
  { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 stat -c %s 2>/dev/null \
    | awk '{s += $1} END {print int(s / 1048576) + 1}' || true  # stat's failure on a missing file is not ours
}

carry_check() {  # MIN_MIB: stop (one line) before any packing when a call has less room than that
  local chunk=${CHUNK_MIB:-$((63 - $(carry_tree_mib)))}
  [ "$chunk" -ge "$1" ] \
    || { echo "pack: the working tree leaves ${chunk} MiB per call (64 MiB in all; CHUNK_MIB=N overrides)"; exit 1; }
}

carry_pack() {
  local out=$1 min=$2 title=$3 chunk n f
  carry_check "$min"
  chunk=${CHUNK_MIB:-$((63 - $(carry_tree_mib)))}
  rm -rf "$out/parts" && mkdir -p "$out/parts"
  : > "$out/MANIFEST"
  for f in "$out"/files/*; do
    n=$(basename "$f")
    split -b "${chunk}M" -d -a 2 "$f" "$out/parts/$n.part-"
    echo "$n $(sha256sum "$f" | cut -d' ' -f1) $(ls "$out/parts/$n".part-* | wc -l)" >> "$out/MANIFEST"
  done
  local i=0 size dir placed used j
  declare -A used_mib=()
  for part in $(ls -S "$out"/parts/*); do
    size=$(( ($(stat -c %s "$part") + 1048575) / 1048576 )); placed=""
    for ((j = 0; j < i; j++)); do
      used=${used_mib[$j]}
      if [ $((used + size)) -le "$chunk" ]; then placed=$j; break; fi
    done
    if [ -z "$placed" ]; then placed=$i; used_mib[$i]=0; i=$((i + 1)); fi
    dir=$(printf "%s/call-%02d" "$out" "$placed"); mkdir -p "$dir"
    mv "$part" "$dir/"; used_mib[$placed]=$(( ${used_mib[$placed]} + size ))
  done
  for dir in "$out"/call-*; do cp "$out/MANIFEST" "$dir/"; done
  rm -rf "$out/files" "$out/parts"
  { echo "tree $(carry_tree_mib) MiB, $chunk MiB per call; $title"
    for dir in "$out"/call-*; do echo "  $dir $(du -sm "$dir" | cut -f1) MiB"; done
    cat "$out/MANIFEST"; } | tee "$out/plan.txt"
}

carry_receive() {
  local out=$1 incoming=$2 dest=$3 n sha parts have missing=0 dir
  mkdir -p "$incoming" "$dest"
  for dir in "$out"/call-*; do [ -d "$dir" ] && cp "$dir"/* "$incoming/"; done
  [ -f "$incoming/MANIFEST" ] || return 2
  while read -r n sha parts; do
    if [ -f "$dest/$n" ]; then  # here it may be a file the project built (data/real/corpus.parquet): never replaced
      [ "$(sha256sum "$dest/$n" | cut -d' ' -f1)" = "$sha" ] && continue
      echo "receive: $dest/$n exists and differs from the carried $n: not replaced (move it aside to use the" \
        "carried one; on this machine's own checkout run the stage, not the device script)"; exit 1
    fi
    have=$(ls "$incoming/$n".part-* 2>/dev/null | wc -l)
    if [ "$have" -lt "$parts" ]; then echo "receive: $n has $have of $parts parts"; missing=1; continue; fi
    cat "$incoming/$n".part-* > "$dest/.$n.tmp-$$"
    [ "$(sha256sum "$dest/.$n.tmp-$$" | cut -d' ' -f1)" = "$sha" ] \
      || { rm -f "$dest/.$n.tmp-$$"; echo "receive: $n sha256 mismatch"; exit 1; }
    mv "$dest/.$n.tmp-$$" "$dest/$n" && rm -f "$incoming/$n".part-* && echo "receive: $dest/$n complete"
  done < "$incoming/MANIFEST"
  return $missing
}
