"""Jinja templates and the Compositions that select them (data files beside this module).

Owns nothing but the files; controller.rendering.compose reads them through TEMPLATE_DIR.
"""
from pathlib import Path

TEMPLATE_DIR = Path(__file__).resolve().parent
