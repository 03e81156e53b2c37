"""The Gluon wing's compiler room: what Gluon adds to Triton's compiler (triton/compiler/), which does the compile.
It imports only the Triton wing's compiler room and the layers below, never a launch half (pyproject.toml's
import-linter contract).

    language.py   GLUON: Gluon as Triton's compiler takes it (its source, stages, a failure's advice)
"""
