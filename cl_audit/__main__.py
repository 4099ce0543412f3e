from cl_audit.cli import main

main()
