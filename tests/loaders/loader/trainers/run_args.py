"""The arguments every trainer script here takes (each is run by path, beside this module):
DATA (a packed dataset), OUT (where it records what it trained on), --epochs, --workers."""

from __future__ import annotations

import argparse


def run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers per loader")
    return parser
