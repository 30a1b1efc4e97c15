"""Capture attention rows from real models: ``dump_rows`` and the built-in corpus."""

from forcedweight.dump.capture import dump_rows, parse_index_list, sample_positions
from forcedweight.dump.corpus import builtin_texts, read_text_files, read_texts_table

__all__ = ["dump_rows", "parse_index_list", "sample_positions", "builtin_texts", "read_text_files", "read_texts_table"]
