"""Which device family this build targets."""

NAME = "das-gfx936"
