// Build-only module: the e2e cluster's pause binary (standard library only).
module sessionmem.local/tools/e2e/pause

go 1.26.0
