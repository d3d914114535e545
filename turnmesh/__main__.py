from turnmesh.cli import main

main()
