"""Shared test code that is not a fixture (fixtures live in the conftest.py files).

scratch    a scratch node without an engine: Scratch, SHIPPED_STACKS, MINIMAL_STACK, make_dri
simnode    SimNode: one node of our own on the shared engine (tests/actions)
engines    three extra Docker Engines and an inventory over them (tests/actions, root only)
lintnode   a node config whose image_map points at the sim images (tests/lint)

The CLI runner and the engine helpers are in tests/simkit.py.
"""
