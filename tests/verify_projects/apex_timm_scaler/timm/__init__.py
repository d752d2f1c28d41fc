"""A stand-in for the few parts of timm (huggingface/pytorch-image-models) that
tests/verify_projects/apex_timm_scaler/train.py uses, written for ampmigrate's tests because timm
is not installed where they run. Imported as `timm`, so the migration resolves `ApexScaler` by the
same qualified name (`timm.utils.ApexScaler`) as in a real timm-based repository."""
