"""Check the regexes that ``OpenAIChatBackend(structured_outputs="vllm")`` sends against vLLM's own grammar engines.

vLLM constrains decoding by compiling the request's regex with xgrammar or llguidance, and rejects a request whose
regex they cannot parse. This script needs neither vLLM nor a GPU: for every record of a RoG jsonl file it builds the
KAPING answerer's two :class:`~kglightning.llm.trie.names.NameChoice` sets (the answer over the graph's node names;
the citation over fact lines such as ``(France, location country capital, Paris)``), compiles their regexes with
both engines (over a real tokenizer for xgrammar), then walks allowed outputs (``unknown``, one item, two items) and
forbidden ones (an item with a letter added, ``unknown`` twice) through xgrammar's token matcher. It prints the
counts and every failure.

    pip install xgrammar llguidance   # the engines vLLM ships with; not dependencies of kglightning
    PYTHONPATH=. python tools/check_structured_regex.py ~/.cache/kglightning/pcst_subgraphs/test-<key>.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re

from tqdm.auto import tqdm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("records", help="a RoG jsonl file (e.g. a PCST subgraph cache or data/<name>/test.jsonl)")
    p.add_argument("--limit", type=int, default=200, help="records to check")
    p.add_argument("--max-answers", type=int, default=5)
    p.add_argument("--model", default="bundled:smollm2", help="whose tokenizer xgrammar compiles for")
    args = p.parse_args()
    try:
        import llguidance
        import xgrammar
    except ImportError as e:
        raise SystemExit(f"{e.name} is missing: pip install xgrammar llguidance") from e
    from transformers import AutoTokenizer

    from kglightning.data.records import KGQARecord
    from kglightning.data.text import relation_text
    from kglightning.llm.backends.local_hf import resolve_model
    from kglightning.llm.kaping import fact_line
    from kglightning.llm.trie.names import UNKNOWN, NameChoice

    folder, gguf = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
    compiler = xgrammar.GrammarCompiler(xgrammar.TokenizerInfo.from_huggingface(tok))
    with open(args.records) as f:
        records = [KGQARecord.from_dict(json.loads(line)) for line, _ in zip(f, range(args.limit))]

    def accepts(compiled, text: str) -> bool:
        matcher = xgrammar.GrammarMatcher(compiled)
        if not all(matcher.accept_token(t) for t in tok.encode(text, add_special_tokens=False)):
            return False
        return matcher.is_terminated() or matcher.accept_token(tok.eos_token_id)

    rng = random.Random(0)
    counts = {"records": 0, "names": 0, "xgrammar_compiled": 0, "llguidance_valid": 0, "allowed_accepted": 0,
              "allowed": 0, "forbidden_rejected": 0, "forbidden": 0}  # fmt: skip
    failures: list[tuple[str, str, str]] = []
    for r in tqdm(records, desc="regexes", unit="record"):
        names = sorted({n for h, _, t in r.graph for n in (h, t)})
        cited = [fact_line((h, relation_text(rel), t)) for h, rel, t in r.graph[:10]]
        counts["records"] += 1
        counts["names"] += len(names)
        for items, most in ((names, args.max_answers), (cited, 3)):
            pattern = NameChoice(tuple(items), most).regex()
            if message := llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("regex", pattern)):
                failures.append(("llguidance", r.id, message[:200]))
            else:
                counts["llguidance_valid"] += 1
            try:
                compiled = compiler.compile_regex(pattern)
            except Exception as e:  # noqa: BLE001 (any compile error is a finding to print)
                failures.append(("xgrammar", r.id, str(e)[:200]))
                continue
            counts["xgrammar_compiled"] += 1
            allowed = [UNKNOWN, *items[:1], *(["\n".join(rng.sample(items, 2))] if len(items) > 1 else [])]
            forbidden = [t for t in (f"{items[0]}x" if items else "x", f"{UNKNOWN}\n{UNKNOWN}")
                         if not re.fullmatch(pattern, t)]  # fmt: skip
            for text in allowed:
                counts["allowed"] += 1
                if accepts(compiled, text):
                    counts["allowed_accepted"] += 1
                else:
                    failures.append(("rejects an allowed output", r.id, text))
            for text in forbidden:
                counts["forbidden"] += 1
                if accepts(compiled, text):
                    failures.append(("accepts a forbidden output", r.id, text))
                else:
                    counts["forbidden_rejected"] += 1
    print(json.dumps(counts, indent=1))
    for failure in failures:
        print(" | ".join(failure))
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    main()
