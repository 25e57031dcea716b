"""Chain of Functions: verifiable chart-reasoning questions with gold step rationales.

    from pipeline.data.cof.generate import generate_dataset
    rows, stats = generate_dataset(SynthesizeConfig(seed=0))

tables (random chart tables) -> functions/values (typed atomic functions, registered
in core.FUNCTIONS) -> explorer (typed random walks into chains) -> verbalize
(question, step sentences, prompt) -> generate (splits, dedupe, stats); render
draws a table as a PNG chart.
"""

# Importing the two layers fills core.FUNCTIONS, whichever cof module is used first.
from pipeline.data.cof import functions, values  # noqa: F401
