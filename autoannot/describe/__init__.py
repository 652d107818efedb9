"""What a collective launch is: the table of collectives, the annotation's words, process
groups, call sites, and the rule that derives a launch's annotation from its arguments."""
