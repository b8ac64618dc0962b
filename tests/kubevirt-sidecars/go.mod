module hostpath-provisioner.test/kubevirt-sidecars

go 1.26.0

require (
	github.com/container-storage-interface/spec v1.12.0
	google.golang.org/grpc v1.82.1
	k8s.io/kubelet v0.36.3
)

require (
	golang.org/x/net v0.53.0 // indirect
	golang.org/x/sys v0.43.0 // indirect
	golang.org/x/text v0.36.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260414002931-afd174a4e478 // indirect
	google.golang.org/protobuf v1.36.12-0.20260120151049-f2248ac996af // indirect
)
