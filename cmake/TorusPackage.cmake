# install/export: see below
