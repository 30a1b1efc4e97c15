"""Texts to capture: a built-in corpus of original passages, and readers for user texts.

The built-in corpus (``builtin_texts()``) holds twelve short passages written for this project,
one per genre (narrative, technical, dialogue, news, code, poetry, recipe, letter, legal,
lecture notes, scientific abstract, local history), about 2,900 SmolLM2 tokens in all: varied enough that heads show both peaked
and flat attention rows, small enough to dump on a laptop.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

from forcedweight.errors import InputError

BUILTIN_CORPUS: tuple[tuple[str, str], ...] = (
    (
        "narrative",
        "The ferry left Harrow Point at six, an hour before the fog usually lifted. Mara stood at the "
        "rail with her grandfather's tin box under one arm, counting the buoys as they slid past like "
        "slow green lanterns. She had been told the island would look smaller than she remembered, "
        "and it did: the lighthouse was only a white thumb against the hill, and the pier where she "
        "had once caught a crab the size of a dinner plate was now half its old length, the far end "
        "lost to a winter storm. A boy with a bucket of rope watched her from the cabin door. When "
        "the engine dropped to a murmur he asked whether she was visiting or staying. She said she "
        "did not know yet, which was the truth, and he nodded as if that were a perfectly ordinary "
        "answer on this crossing. On the quay a woman in a yellow coat was waving at nobody in "
        "particular. Mara lifted the box, felt the key inside it shift, and stepped onto the wet "
        "planks. The gulls were louder than the engine now, and somewhere up the hill a dog began to "
        "bark at the sound of a door she had not opened in twenty years.",
    ),
    (
        "technical",
        "A write-ahead log makes a storage engine durable without forcing every page to disk on "
        "every update. Before a transaction modifies a page in memory, the engine appends a record "
        "describing the change to a sequential log file and flushes that record. Because the log is "
        "written sequentially, the flush costs one disk operation even when the transaction touches "
        "pages scattered across the whole database. After a crash, recovery proceeds in three "
        "passes. The analysis pass scans the log from the last checkpoint to find which transactions "
        "were active and which pages may be dirty. The redo pass replays every logged change whose "
        "effect might be missing from disk, restoring the exact state at the moment of the crash, "
        "including the changes of transactions that never committed. The undo pass then rolls back "
        "those uncommitted transactions, writing compensation records so that a crash during "
        "recovery is itself recoverable. Checkpoints bound the work: by periodically recording which "
        "pages are dirty, the engine ensures that recovery never needs to read the log from the "
        "beginning of time. The price is write amplification, since every change is written twice, "
        "once to the log and later to its page.",
    ),
    (
        "dialogue",
        "\"You moved the plant again.\"\n\"It wanted light.\"\n\"It told you that?\"\n\"It leaned. "
        "Plants lean toward what they want. I just helped.\"\n\"It was leaning toward the window "
        "because the window is where I put it, Theo. Now it is next to the radiator.\"\n\"The "
        "radiator is off.\"\n\"It is November.\"\n\"Then it will be a warm plant. Warm plants are "
        "happy plants.\"\n\"Where did you read that?\"\n\"I did not read it. I inferred it.\"\n"
        "\"From what?\"\n\"From me. I am a warm person and I am happy.\"\n\"You are the least "
        "happy person I know before ten in the morning.\"\n\"That is because I am not near a "
        "radiator.\"\n\"Fine. We will leave it there for one week. If a single leaf turns brown, it "
        "goes back to the window and you buy the coffee until spring.\"\n\"And if it thrives?\"\n"
        "\"Then you may name it.\"\n\"I have already named it.\"\n\"Of course you have. What is "
        "its name?\"\n\"Radiator.\"",
    ),
    (
        "news",
        "LOWER FENWICK — The town council voted five to two on Tuesday night to convert the disused "
        "grain depot on Canal Street into a covered market, ending a debate that has divided "
        "residents for almost three years. The plan, estimated at 4.2 million, will be paid for "
        "with a regional regeneration grant and a loan repayable from stall rents over fifteen "
        "years. Supporters said the market would bring weekday trade back to a street where nine of "
        "twenty shop fronts now stand empty. Opponents, including the two dissenting councillors, "
        "argued that the rent projections assume a level of footfall the town has not seen since "
        "the bypass opened, and that the building's timber roof may need more repair than the "
        "survey allowed for. The council's engineer told the meeting that a second inspection had "
        "found rot in four of the thirty-two roof trusses, all of which can be replaced within the "
        "existing budget. Work is expected to begin in March, with the first stalls opening the "
        "following spring. A public consultation on the allocation of stalls, which will favour "
        "local producers, opens next month and runs for six weeks.",
    ),
    (
        "code",
        "def merge_intervals(intervals):\n"
        "    \"\"\"Merge overlapping closed intervals; return them sorted by start.\"\"\"\n"
        "    if not intervals:\n"
        "        return []\n"
        "    ordered = sorted(intervals, key=lambda pair: pair[0])\n"
        "    merged = [list(ordered[0])]\n"
        "    for start, end in ordered[1:]:\n"
        "        last = merged[-1]\n"
        "        if start <= last[1]:\n"
        "            last[1] = max(last[1], end)\n"
        "        else:\n"
        "            merged.append([start, end])\n"
        "    return [tuple(pair) for pair in merged]\n"
        "\n"
        "\n"
        "class RateLimiter:\n"
        "    \"\"\"Token bucket: `rate` tokens per second, at most `burst` saved up.\"\"\"\n"
        "\n"
        "    def __init__(self, rate, burst, clock):\n"
        "        self.rate = rate\n"
        "        self.burst = burst\n"
        "        self.clock = clock\n"
        "        self.tokens = burst\n"
        "        self.updated = clock()\n"
        "\n"
        "    def allow(self, cost=1):\n"
        "        now = self.clock()\n"
        "        elapsed = now - self.updated\n"
        "        self.updated = now\n"
        "        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)\n"
        "        if self.tokens >= cost:\n"
        "            self.tokens -= cost\n"
        "            return True\n"
        "        return False\n",
    ),
    (
        "poetry",
        "The kettle keeps the hour in steam,\nthe window keeps the rain;\nthe street lamp keeps a "
        "yellow dream\nof summer in its pane.\n\nI keep the letters you did not send,\nthe ones "
        "you meant to write,\nfolded in the book I lend\nto no one overnight.\n\nThe river keeps "
        "its one long word\nit has been saying since\nthe valley was a thing that heard\nand did "
        "not yet wince.\n\nAnd what keeps me? The small things do:\na cup, a coat, a key,\nthe way "
        "the morning, passing through,\nremembers to keep me.\n\nSo let the clocks keep what they "
        "will,\nthe ledger and the bell;\nthe kettle sings, the street is still,\nand all of it is "
        "well.",
    ),
    (
        "recipe",
        "Brown butter and sage gnocchi, for four. Boil one kilogram of floury potatoes in their "
        "skins until a knife slides in without resistance, about twenty-five minutes. Peel them "
        "while still hot, holding each in a tea towel, and pass them through a ricer onto a floured "
        "board. Let the steam escape for five minutes; wet potato makes heavy gnocchi. Scatter two "
        "hundred grams of flour and a pinch of salt over the potato, add one beaten egg, and bring "
        "it together with a bench scraper, folding rather than kneading, until it just holds. Roll "
        "the dough into ropes as thick as your thumb and cut them into short pillows. Cook them in "
        "batches in well-salted simmering water; they are done a minute after they float. Meanwhile "
        "melt a hundred grams of butter in a wide pan over medium heat and let it foam, then turn "
        "nutty and brown, swirling so the solids do not burn. Add a dozen sage leaves, which will "
        "crisp in seconds. Lift the gnocchi straight from the water into the pan, toss, and finish "
        "with lemon zest, black pepper and a handful of grated hard cheese.",
    ),
    (
        "letter",
        "Dear Mr. Okafor,\n\nThank you for your letter of the 12th and for the photographs of the "
        "damaged shipment. I am sorry that the chairs reached you in that condition. Having "
        "compared your pictures with our packing records, I believe the crate was dropped on its "
        "corner during unloading: the splits in the two front legs line up with a dent in the "
        "crate's frame, and the chairs were wrapped and braced as usual when they left our "
        "workshop. We will of course replace both chairs at no cost to you. Because the oak for "
        "this set came from a single board, our joiner would like to make the replacements from "
        "the same stock so that the grain and colour match the other four; this will take about "
        "three weeks. If you would rather have them sooner, we can send two chairs from our "
        "showroom, though the match will be less exact. Please let me know which you prefer. We "
        "have also filed a claim with the carrier, so there is nothing further you need to do "
        "about the damaged pair except keep them until their inspector has called.\n\nWith "
        "apologies and best regards,\nHelen Marsh, Marsh & Daughters Joinery",
    ),
    (
        "legal",
        "1. Definitions. In this Agreement, \"Confidential Information\" means any information "
        "disclosed by one party (the \"Discloser\") to the other (the \"Recipient\") that is "
        "marked as confidential or that a reasonable person would understand to be confidential, "
        "but does not include information that (a) is or becomes public through no fault of the "
        "Recipient; (b) was lawfully known to the Recipient before disclosure; (c) is received "
        "from a third party without a duty of confidence; or (d) is independently developed by "
        "the Recipient without use of the Discloser's information.\n2. Obligations. The Recipient "
        "shall use Confidential Information only to evaluate the proposed collaboration, shall "
        "protect it with at least the care it uses for its own information of a similar kind, and "
        "shall disclose it only to employees and advisers who need to know it and who are bound "
        "by duties no less protective than these.\n3. Term. The obligations in clause 2 last for "
        "three years from the date of each disclosure. On written request the Recipient shall "
        "return or destroy all Confidential Information, except copies kept in routine backups, "
        "which remain subject to this Agreement.",
    ),
    (
        "lecture",
        "Lecture 7 notes: why the sky is blue but sunsets are red. Sunlight contains every visible "
        "wavelength. When it passes through the atmosphere it meets molecules of nitrogen and "
        "oxygen that are much smaller than the wavelength of the light. Such small particles "
        "scatter light with an intensity proportional to the inverse fourth power of the "
        "wavelength, a result due to Rayleigh. Blue light, at around 450 nanometres, is therefore "
        "scattered roughly five times more strongly than red light at 700 nanometres. Look at any "
        "patch of sky away from the sun and you are seeing light that has been scattered toward "
        "you, which is dominated by the short wavelengths: the sky looks blue. Why not violet, "
        "which scatters even more? Partly because sunlight holds less violet to begin with, partly "
        "because some is absorbed high in the atmosphere, and partly because our eyes are less "
        "sensitive to it. At sunset the direct light crosses perhaps forty times more air before "
        "reaching you. Most of the blue has been scattered out of the beam along the way, and what "
        "survives is the red and orange end of the spectrum. Exercise: estimate the ratio for "
        "green light at 530 nanometres.",
    ),
    (
        "abstract",
        "Abstract. Small freshwater lakes are often treated as well mixed in regional carbon budgets, "
        "yet many stratify for weeks during calm summers. We measured dissolved oxygen, temperature "
        "and methane at one-metre depth intervals in fourteen lakes between 0.5 and 12 hectares, "
        "sampling every four days from May to September. Eleven of the fourteen stratified for at "
        "least twenty consecutive days, and in those lakes methane below the thermocline rose by a "
        "median factor of 38 relative to the surface. When wind events broke the stratification, "
        "between 40 and 70 percent of the stored methane was released within three days, a pulse "
        "that sampling at monthly intervals would miss entirely. A simple model driven by daily wind "
        "speed and lake area reproduced the timing of 19 of 23 observed mixing events. Scaling the "
        "model to the 2,300 small lakes of the study region suggests that annual methane emissions "
        "from these lakes are underestimated by a factor of 1.6 to 2.4 when stratification is "
        "ignored. We argue that lake area alone is a poor predictor of emissions and that sampling "
        "designs should be triggered by wind events rather than fixed calendars.",
    ),
    (
        "history",
        "In the winter of 1784 the river froze so hard that carts crossed it for eleven weeks, and "
        "the town's two bridges, which had been a source of tolls and quarrels for a century, were "
        "for once of no use to anybody. The toll keepers' accounts, which survive in the county "
        "archive, record nothing from the middle of December to the first days of March except a "
        "single entry: a shilling taken from a drover who, by his own account, did not trust the "
        "ice. The thaw, when it came, was sudden. Blocks of ice the size of barns piled against "
        "the piers of the lower bridge, and on the night of the fourth of March two of its five "
        "arches gave way. Nobody was killed, though a baker's boy who had been sent across with "
        "bread for the watchmen was stranded on the middle pier until morning. The rebuilding took "
        "six years and was paid for by a new toll, which the townspeople resented more than the "
        "old one, since it applied to foot passengers as well as carts. A petition against it, "
        "signed by three hundred and twelve residents, is the earliest list of the town's "
        "inhabitants that we possess, and for that reason it is consulted far more often today "
        "than it was by the magistrates to whom it was addressed.",
    ),
)


def builtin_texts() -> list[str]:
    """The built-in corpus, in a fixed order (text_id = index)."""
    return [text for _genre, text in BUILTIN_CORPUS]


def builtin_genres() -> list[str]:
    """The genre of each built-in passage, aligned with :func:`builtin_texts`."""
    return [genre for genre, _text in BUILTIN_CORPUS]


def read_text_files(paths: Sequence[str | os.PathLike]) -> list[str]:
    """One text per plain-text file (UTF-8), in the order given."""
    texts = []
    for path in paths:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(f"--text-file: {path}: no such file") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--text-file: {path}: cannot read as UTF-8 text ({exc})") from None
        if not text.strip():
            raise InputError(f"--text-file: {path}: the file is empty")
        texts.append(text)
    return texts


def read_texts_table(path: str | os.PathLike) -> list[str]:
    """The ``text`` column of a Parquet file or a JSON-lines file (one object per line), in order."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"--texts: {path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"--texts: {path}: not a readable Parquet file ({str(exc).splitlines()[0]})") from None
        if "text" not in table.column_names:
            raise InputError(f"--texts: {path}: no 'text' column (columns: {', '.join(table.column_names)})")
        values = table.column("text").to_pylist()
    elif suffix in (".jsonl", ".ndjson", ".json"):
        values = []
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"--texts: {path}: cannot read ({exc})") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"--texts: {path}:{number}: invalid JSON ({exc.msg})") from None
            if not isinstance(obj, dict) or "text" not in obj:
                raise InputError(f"--texts: {path}:{number}: expected an object with a 'text' field")
            values.append(obj["text"])
    else:
        raise InputError(f"--texts: {path}: expected a .parquet or .jsonl file")
    for i, value in enumerate(values):
        if not isinstance(value, str) or not value.strip():
            raise InputError(f"--texts: {path}: text {i} is empty or not a string")
    if not values:
        raise InputError(f"--texts: {path}: holds no texts")
    return values
