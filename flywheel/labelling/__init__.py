"""slimserve.flywheel.labelling: a person labels the logged images worth labelling on a
local page (items: the images; store: the class-folder tree and its provenance; page: the
WSGI app; session: one run of it from a typed config)."""
