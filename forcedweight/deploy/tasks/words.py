"""Small built-in word lists for the synthetic tasks (RULER draws keys from adjective-noun pairs and
common words from a dictionary; these lists are written for this project, no download)."""

ADJECTIVES = (
    "able", "ancient", "angry", "bitter", "bold", "brave", "bright", "broad", "busy", "calm", "careful",
    "cheap", "clever", "cold", "crisp", "curious", "damp", "dark", "deep", "eager", "early", "empty",
    "faint", "fancy", "fierce", "flat", "fresh", "gentle", "giant", "glad", "golden", "grand", "green",
    "happy", "heavy", "hollow", "humble", "icy", "jolly", "keen", "large", "lazy", "little", "lively",
    "loud", "lucky", "mellow", "merry", "mighty", "modern", "narrow", "neat", "noble", "odd", "pale",
    "plain", "polite", "proud", "quick", "quiet", "rapid", "rare", "rich", "rough", "round", "royal",
    "rusty", "salty", "sharp", "shiny", "silent", "silver", "simple", "sleepy", "slim", "smooth", "soft",
    "sour", "spicy", "steady", "steep", "sticky", "stormy", "strange", "sweet", "swift", "tall", "tame",
    "tender", "thin", "tidy", "tiny", "vast", "warm", "wary", "wet", "wide", "wild", "wise", "young",
)

NOUNS = (
    "anchor", "apple", "arrow", "badge", "barrel", "basket", "beacon", "bell", "blanket", "bottle",
    "bridge", "bucket", "cabin", "candle", "canyon", "castle", "cellar", "chair", "cloud", "comet",
    "compass", "cottage", "crayon", "desert", "diamond", "dragon", "drum", "eagle", "engine", "falcon",
    "feather", "fence", "forest", "fountain", "garden", "garlic", "glacier", "hammer", "harbor",
    "helmet", "island", "jacket", "jungle", "kettle", "ladder", "lantern", "lemon", "magnet", "marble",
    "meadow", "mirror", "monkey", "mountain", "needle", "oyster", "paddle", "parrot", "pebble", "pepper",
    "piano", "pillow", "planet", "pocket", "puzzle", "rabbit", "ribbon", "river", "rocket", "saddle",
    "sailor", "shadow", "shovel", "spider", "statue", "stone", "sugar", "tablet", "teapot", "thunder",
    "ticket", "tiger", "tomato", "tower", "trumpet", "tunnel", "turtle", "umbrella", "valley", "violin",
    "wagon", "walnut", "whistle", "window", "wizard", "yacht", "zebra",
)

VERBS = (
    "admire", "arrive", "balance", "borrow", "breathe", "build", "carry", "chase", "climb", "collect",
    "cook", "dance", "deliver", "discover", "dream", "drift", "explain", "fold", "gather", "glow",
    "guard", "hurry", "imagine", "invent", "jump", "juggle", "knit", "laugh", "listen", "measure",
    "mend", "notice", "offer", "paint", "plant", "polish", "pour", "promise", "question", "repair",
    "rescue", "search", "shiver", "sketch", "sparkle", "stretch", "swim", "travel", "wander", "whisper",
)

#: RULER's noise haystack sentence block
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
