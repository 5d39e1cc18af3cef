"""Who may do what, and what is kept secret (DESIGN.md, "Trust boundaries"): the region's CA
(pki.py), API tokens and their roles (tokens.py), secret values sealed at rest (sealing.py), files
only their owner reads (secretfile.py), and etcd's auth for controld's certificate (etcdauth.py)."""
