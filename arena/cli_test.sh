# cli_test.sh: baton-arena's command line: create/info/verify, exit codes
# (0 ok, 1 failure, 2 usage), messages, and the default /dev/shm location.
. tests/lib.sh
A=$BIN/baton-arena
SYN="--synthetic --layers 2 --experts 4 --top-k 2 --d-model 64 --d-ff 128"

t_help() {
	expect 0 $A --help; says "usage: baton-arena create"
	expect 0 $A create --help; says "--safetensors"
	expect 2 $A; says "no command"
	expect 2 $A frobnicate x; says 'unknown command "frobnicate"'
}

t_create_info_verify() {
	p=$T_TMP/a.arena
	expect 0 $A create $SYN --dtype bf16 --seed 3 $p; says "built $p"
	expect 0 $A create $SYN --dtype bf16 --seed 3 $p; says "reused $p"
	expect 1 $A create $SYN --dtype bf16 --seed 4 $p; says "another arena"
	expect 0 $A create $SYN --dtype bf16 --seed 4 --force --threads 1 $p; says "built"
	expect 0 $A info $p; says "2 layers x 4 experts, top-k 2, d_model 64, d_ff 128"
	says "gate bf16, up bf16, down bf16, router f32, norm f32"; says "seed=4"
	expect 0 $A info --json $p; says '"d_ff": 128'; says '"has_norm": true'
	grep -q '"entries"' "$T_TMP/out" && fail "entries without --entries"
	expect 0 $A info --json --entries $p; says '"entries"'; says '"checksum"'
	python3 -c "import json,sys; j=json.load(open(sys.argv[1])); assert len(j['entries']) == 12" "$T_TMP/out" || fail "not 12 entries"
	expect 0 $A verify $p; says "^ok $p: 8 experts"
}

t_verify_names_entry() {
	p=$T_TMP/v.arena
	expect 0 $A create $SYN --dtype q8_0 --seed 1 $p
	# flip a byte inside layer 1 expert 2's blob (offsets from info --json --entries)
	off=$($A info --json --entries $p | python3 -c "
import json,sys
for e in json.load(sys.stdin)['entries']:
    if e['role'] == 'expert' and e['layer'] == 1 and e['expert'] == 2:
        print(e['offset'] + e['parts'][2]['offset'] + 7)") || fail "no offset"
	python3 -c "
import sys
f = open(sys.argv[1], 'r+b'); f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2]))
f.write(bytes([b[0] ^ 0x10]))" $p $off || fail "cannot flip a byte"
	expect 0 $A info $p   # open does not read the blobs
	expect 1 $A verify $p; says "checksum mismatch in layer 1 expert 2"; says "1 bad entry"
}

t_bad_files() {
	printf 'hello' >$T_TMP/x.arena
	expect 1 $A info $T_TMP/x.arena; says "bad_magic"
	expect 1 $A verify $T_TMP/none.arena; says "not_found"
	expect 1 $A create --gguf $T_TMP/x.arena $T_TMP/y.arena; says "not a GGUF file"
	[ ! -e $T_TMP/y.arena ] || fail "an arena was left behind"
}

t_usage_errors() {
	p=$T_TMP/u.arena
	expect 2 $A create $p; says "exactly one of"
	expect 2 $A create --synthetic --gguf x $p; says "exactly one of"
	expect 2 $A create $SYN; says "one arena PATH"
	expect 2 $A create $SYN $p extra; says "one arena PATH"
	expect 2 $A create --synthetic --layers 2 --experts 4 --d-model 64 --d-ff 128 $p; says "needs --top-k"
	expect 2 $A create --synthetic --experts 4 --top-k 2 --d-model 64 --d-ff 128 $p; says "needs --layers"
	expect 2 $A create $SYN --layers abc $p; says '"abc" is not a number'
	expect 2 $A create $SYN --layers -1 $p; says "not a number"
	expect 2 $A create $SYN --layers 5000 $p; says "larger than 4096"
	expect 2 $A create $SYN --d-model 1048576 $p; says "larger than"
	expect 2 $A create $SYN --top-k 9 $p; says "larger than --experts"
	expect 2 $A create $SYN --layers 0 $p; says "at least 1"
	expect 2 $A create $SYN --dtype q5_K $p; says "not one of f32, f16, bf16, q8_0, q4_K, q6_K"
	expect 1 $A create $SYN --dtype q4_K $p; says "multiples of 256"
	expect 2 $A create $SYN --experts-only $p; says "--experts-only is for --gguf and --safetensors"
	expect 2 $A create --gguf x --preset qwen3-30b-a3b $p; says "go with --synthetic-arch"
	expect 2 $A create --synthetic-arch qwen3_moe --preset nope $p; says 'unknown --preset "nope"'
	expect 2 $A create --synthetic-arch qwen3_moe $p; says "needs --preset or all of"
	expect 2 $A create --synthetic-arch qwen3_moe --preset qwen3-30b-a3b --heads 0 $p; says "--heads must be at least 1"
	expect 2 $A create $SYN --bogus $p; says 'unknown or incomplete option "--bogus"'
	expect 2 $A create $SYN --seed; says "incomplete"
	expect 2 $A create --gguf x --layers 3 $p; says "for --synthetic only"
	expect 2 $A create --gguf x --top-k 3 $p; says "top-k comes from the file"
	expect 2 $A info; says "give an arena PATH"
	expect 2 $A info --entries $p; says "goes with --json"
	expect 2 $A info --frob $p; says "unknown option"
	expect 2 $A verify a b; says "give one PATH"
	expect 1 $A create $SYN --dtype q8_0 --d-model 48 $p; says "multiples of 32"
	[ ! -e $p ] || fail "an arena was left behind"
}

# A whole model: info says its architecture, config and tokenizer; a
# version 1 file is refused with the command that makes it again.
t_model() {
	p=$T_TMP/m.arena
	expect 0 $A create --synthetic-arch mixtral --layers 2 --experts 4 --top-k 2 --d-model 64 \
	    --d-ff 128 --heads 4 --kv-heads 2 --vocab 50 --dtype bf16 $p; says "built $p"
	expect 0 $A info $p; says "arch       mixtral"; says "dense      17 tensors"
	says "config     hidden_size 64, num_hidden_layers 2, num_attention_heads 4"
	says "tokenizer  none"; says "metadata   config.json"
	says "source     synthetic mixtral seed=0 dtype=bf16"
	expect 0 $A info --json --entries $p; says '"arch": "mixtral"'; says '"model_type": "mixtral"'
	says '"name": "model.layers.1.block_sparse_moe.gate.weight"'
	expect 0 $A verify $p; says "8 experts, 17 dense tensors and 1 metadata blobs"
	# --tokenizer: a random model that an engine can serve text on
	t=$T_TMP/mt.arena
	expect 0 $A create --synthetic-arch mixtral --layers 2 --experts 4 --top-k 2 --d-model 64 \
	    --d-ff 128 --heads 4 --kv-heads 2 --vocab 3000 --tokenizer models/kjv-mixtral $t
	expect 0 $A info $t; says "tokenizer  tokenizer.json"; says "chat_template.jinja"
	expect 1 $A create --synthetic-arch mixtral --layers 2 --experts 4 --top-k 2 --d-model 64 \
	    --d-ff 128 --tokenizer $T_TMP $T_TMP/none.arena; says "no tokenizer.json"
	expect 2 $A create $SYN --tokenizer models/kjv-mixtral $T_TMP/none.arena
	says "--tokenizer goes with --synthetic-arch"
	# the same file claiming version 1 (the version is read before anything else)
	python3 - "$p" <<'PY' || fail "cannot make a v1 header"
import struct, sys
f = open(sys.argv[1], "r+b"); h = bytearray(f.read(1024))
h[8:12] = struct.pack("<I", 1)
f.seek(0); f.write(h)
PY
	expect 1 $A info $p; says "version 1"; says "Recreate it: baton-arena create --synthetic --layers 2"
}

t_default_location() {
	[ -w /dev/shm ] || return 0
	name=baton-cli-test-$$
	expect 0 $A create $SYN --seed 9 $name; says "built /dev/shm/baton/$name.arena"
	expect 0 $A verify $name; says "/dev/shm/baton/$name.arena"
	rm -f /dev/shm/baton/$name.arena /dev/shm/baton/$name.arena.lock
}

t_case t_help
t_case t_create_info_verify
t_case t_verify_names_entry
t_case t_bad_files
t_case t_usage_errors
t_case t_model
t_case t_default_location
t_done
