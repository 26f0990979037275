"""The worker's defaults that both its command line and its app read.

Here, in a module that imports nothing, so that the app need not import the command
line for them: the command line imports serving lazily, and serving imports the app, so
the app importing the command line closed a circle.
"""

MAX_BODY_BYTES = 1 << 20
"""1 MiB, the largest inference body read (413 past it): a demo-cnn input is 12 KB
binary, about 60 KB as JSON."""
