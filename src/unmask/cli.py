"""The `unmask` command. Flags are snake_case, as in Hugging Face's scripts."""

from __future__ import annotations

import argparse
import sys

from unmask.data.sources import DataError


def _probability(value: str) -> float:
    p = float(value)
    if not 0.0 < p < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {value}")
    return p


def _add_demo_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the readable report")
    parser.add_argument("--plot", metavar="FILE.png", help="draw the lesson's two-panel figure")
    parser.add_argument("--mlm_probability", type=_probability, default=0.15,
                        help="probability that a maskable token is chosen (default 0.15)")
    parser.add_argument("--mask_special_tokens", action="store_true",
                        help="drop the guard that keeps [CLS]/[SEP] from being chosen")
    parser.add_argument("--shared_follower", action="store_true",
                        help='"sat" and "ran" are both followed by "on"')
    parser.add_argument("--blank", choices=["verb", "subject"], default="verb",
                        help="the word the fill-in-the-blank test hides (subject = position 1)")
    parser.add_argument("--seed", type=int, default=0)


def _run_demo(args) -> None:
    from unmask.demo import DemoOptions, main

    options = DemoOptions(mlm_probability=args.mlm_probability, mask_special_tokens=args.mask_special_tokens,
                          shared_follower=args.shared_follower, blank=args.blank, seed=args.seed)
    main(options, as_json=args.json, plot_path=args.plot)


def _run_quickstart(args) -> None:
    print("unmask quickstart: the lesson on its embedded synthetic data\n")
    _run_demo(args)


def _run_tokenizer_train(args) -> None:
    from unmask.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(args.files, args.vocab_size, lowercase=args.lowercase,
                                min_frequency=args.min_frequency, text_field=args.text_field,
                                model_max_length=args.model_max_length, output_dir=args.output_dir)
    print(f"trained a WordPiece tokenizer with {tokenizer.vocab_size:,} tokens -> {args.output_dir}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="unmask", description="Pretrain, fine-tune and serve BERT-style encoders.")
    commands = parser.add_subparsers(dest="command", required=True)

    quickstart = commands.add_parser("quickstart", help="run the main job on embedded data (no download)")
    _add_demo_flags(quickstart)
    quickstart.set_defaults(run=_run_quickstart)

    demo = commands.add_parser("demo", help="the masking lesson on synthetic data")
    _add_demo_flags(demo)
    demo.set_defaults(run=_run_demo)

    tokenizer = commands.add_parser("tokenizer", help="tokenizer tools")
    tokenizer_commands = tokenizer.add_subparsers(dest="tokenizer_command", required=True)
    train = tokenizer_commands.add_parser("train", help="train a BERT WordPiece tokenizer")
    train.add_argument("files", nargs="+", help="text, .jsonl or .gz files, or globs")
    train.add_argument("--vocab_size", type=int, default=30522)
    train.add_argument("--output_dir", required=True)
    train.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=True,
                       help="lowercase and strip accents (uncased); --no-lowercase keeps case")
    train.add_argument("--min_frequency", type=int, default=2)
    train.add_argument("--text_field", default="text", help="the field holding the text in .jsonl files")
    train.add_argument("--model_max_length", type=int, default=512)
    train.set_defaults(run=_run_tokenizer_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except (DataError, ValueError, FileNotFoundError) as e:
        print(f"unmask: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
