# tokenize_cli_test.sh: `baton tokenize` and `baton detokenize` on the
# fixture tokenizers: ids as Hugging Face gives them, --json, stdin, the
# round trip, and exit codes (0 done, 1 failed, 2 usage) with their messages.
. tests/lib.sh
B=$BIN/baton
F=text/fixtures

# The first fixture case with BOS: string 6 of mixtral is "Hello world".
t_tokenize_ids() {
	ref=$(sed -n 6p $F/mixtral/cases.jsonl | python3 -c "import json,sys; print(' '.join(map(str, json.load(sys.stdin)['ids_special'])))")
	[ "$(sed -n 6p $F/mixtral/strings.jsonl)" = '"Hello world"' ] || fail "fixture moved"
	expect 0 $B tokenize --tokenizer $F/mixtral/tokenizer.json "Hello world"
	[ "$(cat $T_TMP/out)" = "$ref" ] || fail "got $(cat $T_TMP/out), want $ref"
	expect 0 $B tokenize --tokenizer $F/mixtral/gguf.json "Hello world"
	[ "$(cat $T_TMP/out)" = "$ref" ] || fail "gguf: got $(cat $T_TMP/out), want $ref"
	expect 0 $B tokenize --no-add-special --tokenizer $F/mixtral/tokenizer.json "Hello world"
	[ "$(cat $T_TMP/out)" = "${ref#1 }" ] || fail "without BOS: got $(cat $T_TMP/out)"
}

t_json_and_stdin() {
	expect 0 $B --json tokenize --tokenizer $F/qwen3/tokenizer.json "<|im_start|>user"
	python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
assert j['tokens'][0] == '<|im_start|>' and j['pieces'][0] == '<|im_start|>', j
assert len(j['ids']) == len(j['tokens']) == len(j['pieces'])
assert ''.join(j['pieces']) == '<|im_start|>user', j" "$T_TMP/out" || fail "bad --json output"
	expect 0 $B tokenize --no-parse-special --tokenizer $F/qwen3/tokenizer.json "<|im_start|>"
	[ "$(wc -w < $T_TMP/out)" -gt 1 ] || fail "--no-parse-special kept the special token"
	printf 'from stdin\n' >$T_TMP/in
	$B tokenize --tokenizer $F/gpt2/tokenizer.json - <$T_TMP/in >$T_TMP/ids || fail "stdin"
	$B detokenize --tokenizer $F/gpt2/tokenizer.json $(cat $T_TMP/ids) >$T_TMP/back || fail "detokenize"
	printf 'from stdin\n\n' | cmp -s - $T_TMP/back || fail "round trip: $(cat $T_TMP/back)"
}

t_detokenize() {
	expect 0 $B detokenize --tokenizer $F/mixtral/tokenizer.json "1, 596 317 482"
	[ "$(cat $T_TMP/out)" = "<s> Hell" ] || fail "got '$(cat $T_TMP/out)'"
	expect 0 $B detokenize --skip-special --tokenizer $F/mixtral/tokenizer.json "[1, 596, 317, 482]"
	[ "$(cat $T_TMP/out)" = "Hell" ] || fail "skip: got '$(cat $T_TMP/out)'"
	expect 0 $B --json detokenize --tokenizer $F/mixtral/tokenizer.json 596 317 482
	says '{"text":"Hell"}'
}

t_errors() {
	expect 2 $B tokenize --bogus; says "unknown flag '--bogus'"
	expect 2 $B tokenize --tokenizer $F/gpt2/tokenizer.json; says "wants (ARENA | --tokenizer PATH) and a text"
	expect 2 $B detokenize --tokenizer $F/gpt2/tokenizer.json 1 x2; says "is not a list of token ids"
	expect 1 $B tokenize $T_TMP/model.arena "x"; says "No such file"
	$BUILD/bin/baton-arena create --synthetic --layers 1 --experts 2 --top-k 1 --d-model 32 --d-ff 32 \
	    $T_TMP/experts.arena >/dev/null
	expect 1 $B tokenize $T_TMP/experts.arena "x"; says "has no tokenizer"
	expect 1 $B tokenize --tokenizer $T_TMP/nope.json "x"; says "cannot open"
	$BUILD/bin/baton-arena create --safetensors models/kjv-mixtral $T_TMP/mixtral.arena >/dev/null
	expect 0 $B tokenize $T_TMP/mixtral.arena "Tell me of light."; says "1 394 647 469 333 1132 265"
	expect 0 $B detokenize $T_TMP/mixtral.arena 394 647 469 333 1132 265; says "Tell me of light."
	expect 1 $B detokenize --tokenizer $F/gpt2/tokenizer.json 999999; says "outside the vocabulary"
	printf '{"model":{"type":"Unigram"}}' >$T_TMP/u.json
	expect 1 $B tokenize --tokenizer $T_TMP/u.json "x"; says "Unigram is not supported"
	expect 0 $B tokenize --help; says "usage: baton tokenize"
}

# An arena of a folder whose tokenizer_config.json has transformers' unset
# model_max_length (a 31-digit integer, as Mixtral's and OLMoE's do): the
# tokenizer stored in it loads (it failed with "too big integer").
t_arena_of_real_config() {
	grep -q '"model_max_length": 1000000000000000019884624838656' \
	    tests/fixtures/arena/hf/olmoe/tokenizer_config.json || fail "fixture changed"
	mkdir -m 0750 $T_TMP/arenas
	expect 0 $BIN/baton-arena create --safetensors tests/fixtures/arena/hf/olmoe $T_TMP/arenas/o.arena
	expect 0 $B tokenize $T_TMP/arenas/o.arena "hi there"
	[ -n "$(cat $T_TMP/out)" ] || fail "no ids"
}

t_case t_tokenize_ids
t_case t_arena_of_real_config
t_case t_json_and_stdin
t_case t_detokenize
t_case t_errors
t_done
