#!/usr/bin/env python3
"""ppl_convert.py LLAMA_CPP_SRC [convert_hf_to_gguf.py's arguments]: runs
llama.cpp's own converter (LLAMA_CPP_SRC/convert_hf_to_gguf.py, its gguf-py)
unchanged, with one fallback: a BPE tokenizer whose pre-tokenizer hash
llama.cpp's table does not list (get_vocab_base_pre raises
NotImplementedError: every newly trained vocabulary, such as the demo
models', hashes differently even with a known split pattern) gets the
pre-tokenizer named by BATON_PPL_PRE (e.g. qwen2, the split pattern of
models/kjv-qwen3-moe's tokenizer.json), which is what the converter asks
its user to add to its table. Without BATON_PPL_PRE the error stands.
For scripts/ppl-peer.sh.
"""
import os
import sys


def main():
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        return 2
    src = os.path.abspath(sys.argv[1])
    sys.path.insert(0, src)
    sys.path.insert(1, os.path.join(src, "gguf-py"))
    import convert_hf_to_gguf as conv  # noqa: E402 (torch, gguf, conversion)
    import conversion.base as base  # noqa: E402

    orig = base.TextModel.get_vocab_base_pre
    pre = os.environ.get("BATON_PPL_PRE", "")

    def get_vocab_base_pre(self, tokenizer):
        try:
            return orig(self, tokenizer)
        except NotImplementedError:
            if not pre:
                raise
            sys.stderr.write("ppl_convert.py: pre-tokenizer hash not in llama.cpp's table: "
                             "using %r (BATON_PPL_PRE)\n" % pre)
            return pre

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [os.path.join(src, "convert_hf_to_gguf.py")] + sys.argv[2:]
    conv.main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
