"""BlazeDB's code generator: `model` reads the protocol document; `swift`, `python` and `javascript` write from it."""
