"""``python -m molt_train.config``: print the flag tables of molt_train/README.md (a test checks they are current)."""

from molt_train.config.commands import COMMANDS
from molt_train.config.flags import markdown
from molt_train.config.seed import SEED_FLAGS

if __name__ == "__main__":
    print(markdown(COMMANDS, SEED_FLAGS))
